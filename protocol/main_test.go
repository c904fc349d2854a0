package protocol_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The client tests start servers and context callbacks; none may outlive
// its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
