package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"quotad/policy"
	"quotad/rls/descriptors"
)

// checkCommand validates a policy file, a descriptors file or directory of
// Envoy's rate limit service (--rls-config), or both, as serve loads them,
// for CI: every problem on its own line (file:line: message), then exit 1;
// or a summary line per file and exit 0. Given both, every quotad_policy of
// the descriptors must name a policy of the policy file. A policy file
// without policies is valid (serve starts with it) but is reported with a
// warning, as serve logs one.
func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate a policy file and/or RLS descriptors as serve would load them; prints every problem and exits 1 if there is one",
		Flags: []cli.Flag{
			configFlag("policy file (YAML) to check"),
			&cli.StringFlag{Name: "rls-config", EnvVars: []string{"QUOTAD_RLS_CONFIG"},
				Usage: "descriptors of Envoy's rate limit service to check: a YAML file or a directory of them (envoyproxy/ratelimit's format)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q: give the files as --config and --rls-config", c.Args().Slice())
			}
			path, rlsPath := c.String("config"), c.String("rls-config")
			if path == "" && rlsPath == "" {
				return errors.New("--config is required: the policy file to check (or --rls-config, the RLS descriptors)")
			}
			var cfg *policy.Config
			if path != "" {
				var err error
				if cfg, err = checkPolicies(c, path); err != nil {
					return err
				}
			}
			if rlsPath != "" {
				return checkDescriptors(c, rlsPath, cfg)
			}
			return nil
		},
	}
}

// checkPolicies checks the policy file and prints its summary.
func checkPolicies(c *cli.Context, path string) (*policy.Config, error) {
	cfg, err := policy.LoadConfig(path)
	var problems policy.ConfigErrors
	if errors.As(err, &problems) {
		for _, p := range problems {
			fmt.Fprintln(c.App.ErrWriter, p)
		}
		return nil, fmt.Errorf("%s: %d %s", path, len(problems), plural(len(problems), "problem", "problems"))
	}
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if len(cfg.Policies) == 0 {
		fmt.Fprintf(c.App.ErrWriter, "quotad: warning: %s: %s\n", path, policy.NoPoliciesWarning)
	}
	_, err = fmt.Fprintf(c.App.Writer, "%d %s ok\n", len(cfg.Policies), plural(len(cfg.Policies), "policy", "policies"))
	return cfg, err
}

// checkDescriptors checks the RLS descriptors, and with a policy file
// their quotad_policy names, and prints their summary.
func checkDescriptors(c *cli.Context, path string, policies *policy.Config) error {
	rls, err := descriptors.Load(path)
	if err == nil && policies != nil {
		err = rls.MissingPolicies(func(name string) bool { return policies.Policies[name] != nil })
	}
	var problems descriptors.Errors
	if errors.As(err, &problems) {
		for _, p := range problems {
			fmt.Fprintln(c.App.ErrWriter, p)
		}
		return fmt.Errorf("%s: %d %s", path, len(problems), plural(len(problems), "problem", "problems"))
	}
	if err != nil {
		return fmt.Errorf("--rls-config: %w", err)
	}
	if names := rls.Policies(); policies == nil && len(names) > 0 {
		fmt.Fprintf(c.App.ErrWriter, "quotad: warning: %s: quotad_policy not checked without --config: %s\n", path, strings.Join(names, ", "))
	}
	n := len(rls.Domains())
	_, err = fmt.Fprintf(c.App.Writer, "%d rls %s ok\n", n, plural(n, "domain", "domains"))
	return err
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
