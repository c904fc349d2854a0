package luascript

// ScriptText is the text Redis runs for the script of file name (prelude
// included), for tests that EVAL a script directly; "" for no such script.
func ScriptText(name string) string {
	if name == batchScript.name {
		return batchScript.src
	}
	for _, s := range scripts {
		if s.name == name {
			return s.src
		}
	}
	return ""
}
