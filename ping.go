package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"
)

func pingCommand() *cli.Command {
	return &cli.Command{
		Name:  "ping",
		Usage: "check that the sidecar answers; prints the store in use and Redis health",
		Flags: []cli.Flag{
			socketFlag(),
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up waiting for the sidecar after this long"},
			&cli.BoolFlag{Name: "ready", Value: true, Usage: "exit 1 unless the sidecar is ready (serving and not draining; Redis's health is not part of it); --ready=false only checks that it answers"},
			&cli.BoolFlag{Name: "redis", Usage: "also exit 1 unless Redis answers (redis_ok)"},
		},
		Action: func(c *cli.Context) error {
			reply, err := call(c, map[string]any{"op": "ping"})
			if err == nil && c.Bool("ready") && !reply.Ready {
				return errors.New("the sidecar answers but is not ready (not serving yet, or draining)")
			}
			if err == nil && c.Bool("redis") && !reply.RedisOK {
				why := reply.RedisError
				if why == "" {
					why = "not reached yet"
				}
				return fmt.Errorf("the sidecar answers but Redis does not: %s", why)
			}
			return err
		},
	}
}
