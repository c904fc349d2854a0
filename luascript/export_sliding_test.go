package luascript

// PreludeText is the prelude as the scripts hold it, for tests that EVAL
// its helpers (the sliding window's arithmetic) on given instants.
func PreludeText() string { return prelude }
