package luascript

// ScriptText is the text Redis runs for the script of file name (prelude
// included), for tests that EVAL a script directly; "" for no such script.
func ScriptText(name string) string {
	for _, b := range batches {
		// "batch.lua", the driver's file: the first batch script, one of
		// those that end with it.
		if b.name == name || name == "batch.lua" {
			return b.src
		}
	}
	for _, s := range scripts {
		if s.name == name {
			return s.src
		}
	}
	return ""
}

// ScriptBody is the body of the script of file name as assembled from its
// file (its contract's checks and the pieces it includes), "" for none.
func ScriptBody(name string) string {
	for _, s := range scripts {
		if s.name == name {
			return s.body
		}
	}
	return ""
}

// LazySources are the texts no check loads (lazySources).
func LazySources() []string { return lazySources }
