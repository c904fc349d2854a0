// Package protocol is quotad's wire format: the line codec of the Unix-socket
// JSON protocol, the request and reply types, and a small client for it.
//
// PROTOCOL.md in this directory is the normative specification; the code here
// implements it and its examples are executed by the tests.
//
// The package knows nothing of Redis, policies or sockets beyond reading and
// writing lines: it must never import a Redis client, luascript or policy, so
// that the contract can be read, tested and fuzzed on its own. The bounds of a
// request's fields and the algorithm names are package limits'; this package
// only spells them on the wire. Its one quotad import is limits (a test in
// limits fails otherwise).
package protocol
