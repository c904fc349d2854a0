package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"quotad/doctor"
	"quotad/store"
)

func doctorCommand() *cli.Command {
	flags := append(redisFlags(),
		keyPrefixFlag("the sidecars' --key-prefix"),
		&cli.BoolFlag{Name: "fix", Usage: "give keys without a TTL one: the window's own length, else --default-ttl"},
		&cli.DurationFlag{Name: "default-ttl", Value: doctor.DefaultTTL, Usage: "TTL --fix gives a key that records no window length"},
		&cli.IntFlag{Name: "top", Value: 10, Usage: "how many of the largest request-id sets to list"},
		&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Usage: "give up after this long"},
	)
	return &cli.Command{
		Name:        "doctor",
		Usage:       "scan quotad's keys in Redis: keys without a TTL, of the wrong type, the largest request-id sets, keys per policy",
		Description: fmt.Sprintf("Uses SCAN, never KEYS. Exits %d when it finds a key without a TTL or of the wrong type, even one --fix repaired.", exitDoctor),
		Flags:       flags,
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q", c.Args().Slice())
			}
			opts := doctor.Options{
				KeyPrefix: c.String("key-prefix"), Fix: c.Bool("fix"), DefaultTTL: c.Duration("default-ttl"), Top: c.Int("top"),
			}
			storeOpts := storeOptions(c)
			if err := errors.Join(opts.Validate(), storeOpts.Validate()); err != nil {
				return err
			}
			client, err := store.OpenClient(storeOpts)
			if err != nil {
				return err
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			report, err := doctor.Run(ctx, client, opts)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				err = report.WriteJSON(c.App.Writer)
			} else {
				err = report.WriteText(c.App.Writer)
			}
			if err != nil {
				return err
			}
			if report.Problems > 0 {
				return cli.Exit("", exitDoctor)
			}
			return nil
		},
	}
}
