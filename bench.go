package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"quotad/loadgen"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "load a running sidecar with takes and print decisions/s, latency and results",
		Flags: []cli.Flag{
			socketFlag(),
			&cli.IntFlag{Name: "conns", Aliases: []string{"c"}, Value: 64, Usage: "client connections"},
			&cli.IntFlag{Name: "inflight", Aliases: []string{"n"}, Value: 16, Usage: "requests each connection keeps outstanding (1: one at a time)"},
			&cli.DurationFlag{Name: "duration", Aliases: []string{"d"}, Value: 10 * time.Second, Usage: "how long to send"},
			&cli.IntFlag{Name: "subjects", Value: 10_000, Usage: "distinct subjects, chosen at random per take"},
			&cli.StringFlag{Name: "subject-prefix", Value: "bench-", Usage: "prefix of every subject"},
			&cli.StringFlag{Name: "policy", Aliases: []string{"p"}, Usage: "named policy from the sidecar's config (instead of --limit and --window-ms)"},
			&cli.StringFlag{Name: "algorithm", Usage: "inline algorithm: fixed_window (default), sliding_window, calendar, token_bucket, concurrency"},
			&cli.Int64Flag{Name: "limit", Value: 1_000_000, Usage: "inline limit (fixed, sliding and calendar windows, concurrency)"},
			&cli.Int64Flag{Name: "window-ms", Value: 60_000, Usage: "inline window in milliseconds (fixed and sliding windows)"},
			&cli.StringFlag{Name: "period", Usage: "inline calendar: minute, hour, day, week or month"},
			&cli.StringFlag{Name: "time-zone", Usage: "inline calendar: IANA zone of the periods (default UTC)"},
			&cli.Int64Flag{Name: "rate", Usage: "inline token bucket: tokens per --period-ms"},
			&cli.Int64Flag{Name: "period-ms", Usage: "inline token bucket: period of --rate in milliseconds"},
			&cli.Int64Flag{Name: "burst", Usage: "inline token bucket: tokens it holds (default --rate)"},
			&cli.Int64Flag{Name: "lease-ms", Usage: "inline concurrency: a lease's life in milliseconds"},
			&cli.BoolFlag{Name: "release", Usage: "concurrency: release every lease once its take is answered (needs --request-ids)"},
			&cli.Int64Flag{Name: "cost", Value: 1, Usage: "units per take"},
			&cli.BoolFlag{Name: "request-ids", Usage: "give every take a unique request_id"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress line while running"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q", c.Args().Slice())
			}
			cfg := loadgen.Config{
				Socket:        c.String("socket"),
				Conns:         c.Int("conns"),
				InFlight:      c.Int("inflight"),
				Duration:      c.Duration("duration"),
				Subjects:      c.Int("subjects"),
				SubjectPrefix: c.String("subject-prefix"),
				Policy:        c.String("policy"),
				Cost:          c.Int64("cost"),
				RequestIDs:    c.Bool("request-ids"),
				Release:       c.Bool("release"),
			}
			if cfg.Conns < 1 || cfg.InFlight < 1 || cfg.Duration <= 0 || cfg.Subjects < 1 || cfg.Cost < 1 {
				return errors.New("--conns, --inflight, --duration, --subjects and --cost must be positive")
			}
			if err := benchLimits(c, &cfg); err != nil {
				return err
			}
			if !c.Bool("quiet") {
				cfg.Progress = c.App.ErrWriter
			}
			fmt.Fprintf(c.App.ErrWriter, "%d connections x %d in flight for %v on %s\n", cfg.Conns, cfg.InFlight, cfg.Duration, cfg.Socket)
			res, err := loadgen.Run(c.Context, cfg)
			if werr := res.WriteText(c.App.Writer); err == nil {
				err = werr
			}
			return err
		},
	}
}

// benchLimits copies the inline limits given on the command line into cfg,
// with --limit and --window-ms at their defaults where the algorithm takes
// them; loadgen refuses a mix that does not fit the algorithm.
func benchLimits(c *cli.Context, cfg *loadgen.Config) error {
	cfg.Algorithm = c.String("algorithm")
	for name, v := range map[string]*int64{
		"limit": &cfg.Limit, "window-ms": &cfg.WindowMS, "rate": &cfg.Rate,
		"period-ms": &cfg.PeriodMS, "burst": &cfg.Burst, "lease-ms": &cfg.LeaseMS,
	} {
		if c.IsSet(name) {
			*v = c.Int64(name)
		}
	}
	cfg.Period, cfg.TimeZone = c.String("period"), c.String("time-zone")
	if cfg.Policy != "" {
		if cfg.Algorithm != "" || cfg.Limit != 0 || cfg.WindowMS != 0 || cfg.Rate != 0 || cfg.PeriodMS != 0 ||
			cfg.Burst != 0 || cfg.LeaseMS != 0 || cfg.Period != "" || cfg.TimeZone != "" {
			return errors.New("give --policy or inline limits, not both")
		}
		return nil
	}
	switch cfg.Algorithm {
	case "", "fixed_window", "sliding_window":
		if !c.IsSet("window-ms") {
			cfg.WindowMS = c.Int64("window-ms")
		}
		fallthrough
	case "calendar", "concurrency":
		if !c.IsSet("limit") {
			cfg.Limit = c.Int64("limit")
		}
	}
	return nil
}
