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
			&cli.Int64Flag{Name: "limit", Value: 1_000_000, Usage: "inline limit"},
			&cli.Int64Flag{Name: "window-ms", Value: 60_000, Usage: "inline window in milliseconds"},
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
			}
			if cfg.Conns < 1 || cfg.InFlight < 1 || cfg.Duration <= 0 || cfg.Subjects < 1 || cfg.Cost < 1 {
				return errors.New("--conns, --inflight, --duration, --subjects and --cost must be positive")
			}
			switch {
			case cfg.Policy != "" && (c.IsSet("limit") || c.IsSet("window-ms")):
				return errors.New("give --policy or --limit with --window-ms, not both")
			case cfg.Policy == "":
				cfg.Limit, cfg.WindowMS = c.Int64("limit"), c.Int64("window-ms")
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
