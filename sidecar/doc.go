// Package sidecar is the quotad server: it listens on a Unix socket, reads
// protocol lines from each connection, hands each request to the
// dispatcher (package dispatch), and writes one reply per request in the
// order the requests came.
//
// A connection has one reader and one writer goroutine. Requests on
// different keys run concurrently; requests of one connection on the same
// key run in the order they were written (conn.go). The server answers
// pings itself and serves the operator's endpoints (/metrics, /healthz,
// /readyz, /redisz: http.go). Run (drain.go) is the process's life: it
// serves until SIGTERM, SIGINT or the end of its context, drains, and
// forces the server closed on a second signal.
//
// It never decides quota and never talks to Redis for a decision itself:
// that is the dispatcher's, which owns every decision's metrics too.
package sidecar
