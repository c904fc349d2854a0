// Package redistest starts a real redis-server for tests and checks invariants
// every quotad test shares.
//
// Each Server runs on its own free port on 127.0.0.1 with its data directory in
// the test's temporary directory, and is stopped by t.Cleanup so no process
// outlives the test binary. A missing redis-server is a test failure, never a
// skip: `make test` installs it, and a silently skipped integration suite
// would hide regressions in the Lua scripts.
//
// StartCluster, StartSentinel and WithTLS start the other topologies quotad
// supports the same way; cmd/redistopo runs one for a person (make cluster,
// make sentinel). The kernel kills every redis-server whose starter died
// without cleaning up (Linux).
//
// This package must never be imported by non-test code other than
// cmd/redistopo.
package redistest
