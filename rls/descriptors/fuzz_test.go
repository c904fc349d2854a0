package descriptors

import (
	"os"
	"testing"
)

// Parse never panics, and what it accepts matches without panicking.
func FuzzParse(f *testing.F) {
	seed, err := os.ReadFile("testdata/shop.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	for _, s := range []string{
		"",
		"domain: d\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    metadata: &a {x: [*a]}\n",
		"domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n",
		"a: &a [*a, *a]\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: p, replaces: [{name: q}]}\n",
		"domain: d\n---\n---\n",
		"domain: [1]\n",
		"{domain: d, descriptors: [{key: '', rate_limit: {unit: x}}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatal("a config with an error")
			}
			return
		}
		for _, d := range c.Domains() {
			c.Match(d, []Entry{{"k", "v"}})
			c.Match(d, []Entry{{"k", "abc"}, {"k", ""}})
		}
	})
}
