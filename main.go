// Command quotad is a sidecar that gives every process in a pod atomic,
// idempotent quota decisions backed by Redis, over a line-based JSON protocol
// on a Unix socket. This file only wires the command line: each command, with
// its flags, is in the file named for it (serve.go, take.go, ...); the
// server and its drain live in package sidecar, the wire format in package
// protocol.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

// Exit codes. Every error run returns that is not a cli.ExitCoder exits
// exitError.
const (
	exitOK     = 0
	exitError  = 1 // an error reply, a transport failure, a bad flag, a bad policy file
	exitDenied = 2 // a denial, only with --exit-code
	exitDoctor = 3 // doctor found keys without a TTL or of the wrong type
)

func main() {
	err := run(context.Background(), os.Args, os.Stdout, os.Stderr)
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode prints err, when it says anything, and returns the process's exit
// status: the code of a cli.ExitCoder (cli.Exit), else exitError. It is
// cli.HandleExitCoder without the os.Exit, so tests read the code too.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(stderr, "quotad:", msg)
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return exitError
}

// run is the whole command line, callable from tests without a subprocess.
// Cancelling ctx stops a running `serve` as SIGTERM would.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	app := &cli.App{
		Name:      "quotad",
		Usage:     "atomic, idempotent quota decisions from Redis over a Unix socket",
		Version:   versionLine(),
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed once, by exitCode, and the process exits
		// there, not inside the command.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			serveCommand(),
			checkCommand(),
			requestCommand("take", "take quota and print the JSON reply"),
			requestCommand("peek", "show a window's usage without consuming"),
			requestCommand("release", "free a concurrency lease (named by --request-id)"),
			requestCommand("settle", "give the actual cost (--cost) of an accepted take (--request-id); 0 refunds it"),
			pingCommand(),
			doctorCommand(),
			benchCommand(),
			versionCommand(),
		},
	}
	return app.RunContext(ctx, args)
}
