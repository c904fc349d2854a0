package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"quotad/policy"
)

// checkCommand validates a policy file as serve loads it, for CI: every
// problem on its own line as file:line: message, then exit 1; or a summary
// line and exit 0. A file without policies is valid (serve starts with it)
// but is reported with a warning, as serve logs one.
func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate a policy file as serve would load it; prints every problem and exits 1 if there is one",
		Flags: []cli.Flag{configFlag("policy file (YAML) to check")},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q: give the file as --config", c.Args().Slice())
			}
			path := c.String("config")
			if path == "" {
				return errors.New("--config is required: the policy file to check")
			}
			cfg, err := policy.LoadConfig(path)
			var problems policy.ConfigErrors
			if errors.As(err, &problems) {
				for _, p := range problems {
					fmt.Fprintln(c.App.ErrWriter, p)
				}
				return fmt.Errorf("%s: %d %s", path, len(problems), plural(len(problems), "problem", "problems"))
			}
			if err != nil {
				return fmt.Errorf("--config: %w", err)
			}
			if len(cfg.Policies) == 0 {
				fmt.Fprintf(c.App.ErrWriter, "quotad: warning: %s: %s\n", path, policy.NoPoliciesWarning)
			}
			_, err = fmt.Fprintf(c.App.Writer, "%d %s ok\n", len(cfg.Policies), plural(len(cfg.Policies), "policy", "policies"))
			return err
		},
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
