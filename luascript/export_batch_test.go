package luascript

import "strconv"

// RawCall is a call of the script of file name with keys and args as they
// are, past Go's validation, for tests that send scripts malformed
// arguments; ok is false for no such script.
func RawCall(name string, keys, args []string) (Call, bool) {
	for _, s := range scripts {
		if s.name == name {
			return Call{s: s, keys: keys, args: args}, true
		}
	}
	return Call{}, false
}

// CallOfCommand is the Call a script command of this package's scripts is
// (EVAL or EVAL_RO of a script's text, EVALSHA or EVALSHA_RO of its SHA1),
// for tests that send a lone call through ExecBatch instead; ok is false
// for any other command.
func CallOfCommand(cmd []string) (Call, bool) {
	if len(cmd) < 3 {
		return Call{}, false
	}
	n, err := strconv.Atoi(cmd[2])
	if err != nil || n < 0 || 3+n > len(cmd) {
		return Call{}, false
	}
	for _, s := range scripts {
		var match bool
		switch cmd[0] {
		case "EVAL", "EVAL_RO":
			match = cmd[1] == s.src || cmd[1] == withoutFlags(s.src)
		case "EVALSHA", "EVALSHA_RO":
			match = cmd[1] == s.sha || cmd[1] == sha1Hex(withoutFlags(s.src))
		}
		if match {
			return Call{s: s, keys: cmd[3 : 3+n], args: cmd[3+n:]}, true
		}
	}
	return Call{}, false
}

// CallScript is the file name of the script c calls.
func CallScript(c Call) string {
	if c.s == nil {
		return ""
	}
	return c.s.name
}

// BatchTextWith is the text of a batch script composed of the fixed
// window's scripts (its take first) and one more of body, whose index in
// the batch is returned, for tests of what the driver does with a body
// that fails.
func BatchTextWith(body string) (src string, index byte) {
	s := newScript("extra.lua", body, nil)
	b := newBatch("extra_batch.lua", []*script{fixedWindowTake, fixedWindowPeek, fixedWindowSettle, s})
	return b.src, b.index[s]
}

// BatchOf is the name of the batch script that decides c's calls
// ("batch_fixed_window.lua"), "" for none.
func BatchOf(c Call) string {
	if b := batchOf[c.s]; b != nil {
		return b.name
	}
	return ""
}

// BatchBodies is the number of bodies of the batch script name.
func BatchBodies(name string) int {
	for _, b := range batches {
		if b.name == name {
			return len(b.index)
		}
	}
	return 0
}

// CallKeys and CallArgs are the keys and arguments c sends.
func CallKeys(c Call) []string { return append([]string(nil), c.keys...) }
func CallArgs(c Call) []string { return append([]string(nil), c.args...) }
