package luascript

// SlidingLibText is the prelude and sliding_window.lua, for tests that EVAL
// the sliding window's arithmetic on given instants.
func SlidingLibText() string { return prelude + "\n" + slidingWindowLib }
