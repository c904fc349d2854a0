package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// checksFlag is take's --check, repeated: each is one check of a take of
// several limits, a JSON object as the protocol's "checks" holds them
// ({"policy":"per-user","subject":"user:42"}). It is not a StringSlice
// flag, which would split each object at its commas.
type checksFlag struct{ checks []json.RawMessage }

func (f *checksFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") || !json.Valid([]byte(s)) {
		return fmt.Errorf("%q is not a JSON object such as {\"policy\":\"per-user\",\"subject\":\"user:42\"}", s)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(s)); err != nil {
		return err
	}
	f.checks = append(f.checks, compact.Bytes())
	return nil
}

func (f *checksFlag) String() string {
	parts := make([]string, len(f.checks))
	for i, c := range f.checks {
		parts[i] = string(c)
	}
	return strings.Join(parts, " ")
}

func checkFlag() cli.Flag {
	return &cli.GenericFlag{Name: "check", Value: &checksFlag{},
		Usage: "a take of several limits, all or nothing: give --check once per limit, each a JSON object with its " +
			"policy (or inline limits) and subject, and optionally its own cost; then no subject, --policy or inline flags"}
}

// addressingFlags are the flags that address one limit, which a take of
// checks leaves to its checks.
var addressingFlags = []string{"subject", "policy", "limit", "window-ms", "algorithm", "rate", "period-ms", "burst",
	"lease-ms", "period", "time-zone", "week-start", "jitter-ms"}

// takeChecks puts c's --check objects into req as its checks; ok is false
// when there are none.
func takeChecks(c *cli.Context, req map[string]any) (ok bool, err error) {
	f, _ := c.Generic("check").(*checksFlag)
	if f == nil || len(f.checks) == 0 {
		return false, nil
	}
	if c.NArg() > 0 {
		return true, fmt.Errorf("unexpected arguments %q: the subjects of a take with --check are in its checks", c.Args().Slice())
	}
	for _, name := range addressingFlags {
		if c.IsSet(name) {
			return true, errors.New("give either --check, once per limit, or --" + name + " and the other flags of one limit, not both")
		}
	}
	req["checks"] = f.checks
	return true, nil
}

// takeCall sends a take, with its cost, request id and deadline, and
// exits exitDenied on a denial when --exit-code asks.
func takeCall(c *cli.Context, req map[string]any) error {
	for _, f := range []string{"timeout-ms", "cost"} {
		if c.IsSet(f) {
			req[strings.ReplaceAll(f, "-", "_")] = c.Int64(f)
		}
	}
	if id := c.String("request-id"); id != "" {
		req["request_id"] = id
	}
	reply, err := call(c, req)
	if err != nil {
		return err
	}
	if c.Bool("exit-code") && !reply.Allowed {
		return cli.Exit("", exitDenied)
	}
	return nil
}
