// Package sidecar is the quotad server: it listens on a Unix socket, reads
// protocol lines from each connection, resolves policies from the config
// file, runs the decision scripts through luascript, and writes one reply per
// request in order.
//
// The sidecar never decides quota itself: every take and peek is one Lua
// script in Redis, so that concurrent callers in any number of pods agree. It
// never retries a take in a way that could consume twice, and it never turns
// a Redis failure into an allow or a deny: the caller gets UNAVAILABLE and the
// outcome is unknown.
//
// For operators it also counts what it decides (metrics.go, served with the
// probes by http.go; never a subject in a label), and Doctor inspects the
// keys quotad writes in Redis.
package sidecar
