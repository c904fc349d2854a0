package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// version and commit are stamped at build time with
// -ldflags "-X main.version=... -X main.commit=...". An unstamped commit is
// read from the build's VCS information, when Go recorded it.
var (
	version = "dev"
	commit  = ""
)

// buildInfo is what `quotad version` prints.
type buildInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

func currentBuild() buildInfo {
	return buildInfo{Version: version, Commit: buildCommit(), Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
}

// buildCommit is the commit stamped by the Makefile, else the one Go
// recorded from the checkout it built in (with -dirty for uncommitted
// changes), else "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return "unknown"
	}
	// As short as the Makefile's `git rev-parse --short`.
	return rev[:min(len(rev), 7)] + dirty
}

// versionLine is the one-line form, also printed by --version.
func versionLine() string {
	b := currentBuild()
	return fmt.Sprintf("%s (commit %s, %s, %s)", b.Version, b.Commit, b.Go, b.Platform)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, the commit it was built from and the Go version",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print {"version","commit","go","platform"} as JSON`}},
		Action: func(c *cli.Context) error {
			if c.Bool("json") {
				return json.NewEncoder(c.App.Writer).Encode(currentBuild())
			}
			_, err := fmt.Fprintln(c.App.Writer, "quotad", versionLine())
			return err
		},
	}
}
