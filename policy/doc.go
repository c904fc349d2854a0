// Package policy is quotad's policy file: a YAML mapping of named limits,
// parsed and validated into an immutable Config, and reloaded when the file
// changes.
//
// A policy is a shape of package limits under a name, with the fields that
// say how to take it (mode, on_unavailable, max_request_ids, a bucket's
// dedupe). The algorithm names, the bounds and the rule for a policy name
// are limits'; this package only reads them from YAML and words its
// messages in the file's terms (durations such as 744h, not milliseconds).
//
// The policy file knows no wire and no Redis: the package never imports
// protocol, luascript, store or a Redis client, and of quotad only limits
// (a test in limits fails otherwise).
package policy
