package loadgen_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every run starts two goroutines per connection; none may outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
