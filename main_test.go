package main

import (
	"bytes"
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runCLI drives the command line in process, as main does.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), append([]string{"quotad"}, args...), &out, &errb)
	code = exitCode(err, &errb)
	return out.String(), errb.String(), code
}
