// Package descriptors reads envoyproxy/ratelimit's configuration (the
// descriptors of Envoy's rate limit service, RLS) unchanged, and finds the
// rate limit of a request descriptor as envoyproxy/ratelimit does.
//
// # Files
//
// Load reads one YAML file, or a directory of them: every *.yaml and *.yml
// file in it and in its subdirectories, leaving out names that start with
// a dot (a Kubernetes ConfigMap volume keeps its previous contents under
// ..data and ..<timestamp>). Each file holds one domain:
//
//	domain: edge
//	descriptors:
//	  - key: remote_address
//	    rate_limit: {unit: second, requests_per_unit: 10}
//
// Loading is strict: a key that is not envoyproxy/ratelimit's (or one of
// quotad's extensions) at its place, a bad unit, unlimited with a unit, an
// empty or self replaces, a key (with its value) given twice at one level,
// a domain given by two files: each is an Error naming the file, the line,
// the domain and the descriptor path, and Load returns every one of them
// (Errors). Bounds are package limits' (MaxRLSEntries levels deep,
// MaxRLSKeyBytes, MaxRLSValueBytes, MaxRLSConfigDescriptors).
//
// # Fields
//
// A descriptor's rate_limit becomes a RateLimit. Its fields mean what they
// mean to envoyproxy/ratelimit, and the rls service applies them, not this
// package: RequestsPerUnit per Unit (0 refuses every request); Unlimited
// answers OK without a counter; Name is what another descriptor's Replaces
// names: when a request's descriptors match both, the replaced limit is
// not checked; ShadowMode checks and counts but answers OK; QuotaMode
// answers OK over the limit and marks the status; DetailedMetric and
// ValueToMetric change only Match.MetricKey; Metadata is returned to Envoy
// for the descriptors that passed. A request descriptor's own limit
// override, and windows, are the service's too.
//
// quotad's extensions, which envoyproxy/ratelimit refuses as unknown keys:
// unit_multiplier inside rate_limit (a window of that many units, 1 to
// limits.MaxRLSUnitMultiplier), and quotad_policy: NAME inside rate_limit,
// which has the named policy of quotad's policy file decide the
// descriptor with any algorithm; unit and requests_per_unit must then be
// absent. Whether the policy exists is for the service to check once both
// files are loaded (Config.Policies, Config.MissingPolicies).
//
// # Matching
//
// Config.Match walks a request descriptor's entries from the top of its
// domain: at each level the exact key and value first, then the values
// with a '*' (anywhere in the value, each matching any run of bytes) in
// file order, then the key without a value. A limit applies only where
// the descriptor matched at the request's last entry has one. The maps
// are built at load, so a match allocates only the keys it returns.
//
// # Reload
//
// Reloader keeps a service's Config in step with the files (on a poll and
// on Trigger, for SIGHUP), keeping the config in use when a change fails
// to load or its Check refuses it.
//
// This package knows no wire, no Redis and no policy file.
package descriptors
