package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"quotad/protocol"
)

// take, peek, release and settle: one request to the sidecar each, with the
// same addressing flags.

// algorithmFlags are the inline limits of the algorithms other than the
// fixed window (whose --limit and --window-ms the commands define).
func algorithmFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "algorithm", Usage: "inline algorithm: fixed_window (default), token_bucket, concurrency, sliding_window (with --limit and --window-ms), calendar (with --limit and --period)"},
		&cli.Int64Flag{Name: "rate", Usage: "inline token bucket: tokens per --period-ms"},
		&cli.Int64Flag{Name: "period-ms", Usage: "inline token bucket: period of --rate in milliseconds"},
		&cli.Int64Flag{Name: "burst", Usage: "inline token bucket: tokens it holds (default --rate)"},
		&cli.Int64Flag{Name: "lease-ms", Usage: "inline concurrency: a lease's life in milliseconds"},
		&cli.StringFlag{Name: "period", Usage: "inline calendar: minute, hour, day, week or month (with --limit)"},
		&cli.StringFlag{Name: "time-zone", Usage: "inline calendar: IANA zone of the periods (default UTC)"},
	}
}

// requestFlags are the addressing flags shared by take, peek, release and
// settle, and each one's own.
func requestFlags(op string) []cli.Flag {
	flags := []cli.Flag{
		socketFlag(),
		&cli.StringFlag{Name: "subject", Aliases: []string{"s"}, Usage: "who or what is limited (or give it as the first argument)"},
		&cli.StringFlag{Name: "policy", Aliases: []string{"p"}, Usage: "named policy from the sidecar's config"},
		&cli.Int64Flag{Name: "limit", Usage: "inline limit (with --window-ms)"},
		&cli.Int64Flag{Name: "window-ms", Usage: "inline window in milliseconds (with --limit)"},
		&cli.Int64Flag{Name: "timeout-ms", Usage: "shorten the sidecar's Redis deadline for this request"},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up waiting for the sidecar after this long"},
	}
	flags = append(flags, algorithmFlags()...)
	flags = append(flags,
		&cli.StringFlag{Name: "week-start", Usage: "inline calendar: first day of a week period (default monday)"},
		&cli.Int64Flag{Name: "jitter-ms", Usage: "inline calendar: move this subject's boundaries by up to this many ms"},
	)
	if op == "release" {
		flags = append(flags, &cli.StringFlag{Name: "request-id", Aliases: []string{"r"}, Usage: "the lease to free"})
	}
	if op == "settle" {
		flags = append(flags,
			&cli.Int64Flag{Name: "cost", Required: true, Usage: "the take's actual cost: lower gives back, higher consumes past the limit, 0 refunds"},
			&cli.StringFlag{Name: "request-id", Aliases: []string{"r"}, Required: true, Usage: "the request id of the accepted take"},
		)
	}
	if op == "take" {
		flags = append(flags,
			&cli.Int64Flag{Name: "cost", Value: 1, Usage: "units to take"},
			&cli.StringFlag{Name: "request-id", Aliases: []string{"r"}, Usage: "idempotency key: a retry with the same id gets the original answer"},
			&cli.BoolFlag{Name: "exit-code", Usage: fmt.Sprintf("exit %d when the take is denied (default: a denial exits 0)", exitDenied)},
			checkFlag(),
		)
	}
	return flags
}

func requestCommand(op, usage string) *cli.Command {
	return &cli.Command{
		Name:      op,
		Usage:     usage,
		ArgsUsage: "[subject]",
		// Otherwise a subject named "help" or "h" would print help and
		// exit 0, which a script reads as "allowed".
		HideHelpCommand: true,
		Flags:           requestFlags(op),
		Action: func(c *cli.Context) error {
			req := map[string]any{"op": op}
			if op == "take" {
				if multi, err := takeChecks(c, req); multi {
					if err != nil {
						return err
					}
					return takeCall(c, req)
				}
			}
			// Flags after the subject are not parsed by urfave/cli: refuse
			// them rather than drop a trailing --exit-code silently.
			subject := c.String("subject")
			switch {
			case subject != "" && c.NArg() > 0, c.NArg() > 1:
				return fmt.Errorf("unexpected arguments %q: give one subject, after all flags", c.Args().Slice())
			case subject == "":
				subject = c.Args().First()
			}
			if subject == "" {
				return errors.New("a subject is required (--subject or first argument)")
			}
			req["subject"] = subject
			if p := c.String("policy"); p != "" {
				req["policy"] = p
			}
			if a := c.String("algorithm"); a != "" {
				req["algorithm"] = a
			}
			for _, f := range []string{"limit", "window-ms", "timeout-ms", "cost", "rate", "period-ms", "burst", "lease-ms"} {
				if c.IsSet(f) {
					req[strings.ReplaceAll(f, "-", "_")] = c.Int64(f)
				}
			}
			for _, f := range []string{"period", "time-zone", "week-start"} {
				if c.IsSet(f) {
					req[strings.ReplaceAll(f, "-", "_")] = c.String(f)
				}
			}
			if c.IsSet("jitter-ms") {
				req["jitter_ms"] = c.Int64("jitter-ms")
			}
			if id := c.String("request-id"); id != "" {
				req["request_id"] = id
			}
			if op == "take" {
				return takeCall(c, req)
			}
			_, err := call(c, req)
			return err
		},
	}
}

// call sends one request to the sidecar and prints the reply line. An error
// reply or a transport failure is an error (non-zero exit, message on
// stderr); a denial is not.
func call(c *cli.Context, req map[string]any) (protocol.Reply, error) {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	client, err := protocol.Dial(ctx, c.String("socket"))
	if err != nil {
		return protocol.Reply{}, err
	}
	defer client.Close()
	line, err := json.Marshal(req)
	if err != nil {
		return protocol.Reply{}, fmt.Errorf("encode request: %w", err)
	}
	raw, err := client.Do(ctx, line)
	if err != nil {
		return protocol.Reply{}, err
	}
	fmt.Fprintf(c.App.Writer, "%s\n", raw)
	var reply protocol.Reply
	if err := json.Unmarshal(raw, &reply); err != nil {
		return reply, fmt.Errorf("decode reply: %w", err)
	}
	if err := reply.Err(); err != nil {
		return reply, err
	}
	return reply, nil
}
