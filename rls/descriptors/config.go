package descriptors

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Config is a loaded descriptors file or directory: every domain's
// descriptors, ready to match. It is immutable once built; a reload builds
// a new one.
type Config struct {
	domains map[string]*domain
	uses    []policyUse // every quotad_policy, in file order
	digest  [sha256.Size]byte
}

// domain is one file's descriptors.
type domain struct {
	name string
	file string
	root *node
}

// policyUse is where a descriptor names a quotad policy, so a missing one
// can be reported at its place.
type policyUse struct {
	policy string
	err    Error // the place; Msg is filled when the policy is missing
}

// Domains returns the domains, sorted; none for a nil Config.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Policies returns the quotad policies the descriptors name
// (quotad_policy), sorted, each once.
func (c *Config) Policies() []string {
	var names []string
	if c == nil {
		return nil
	}
	for _, u := range c.uses {
		if !slices.Contains(names, u.policy) {
			names = append(names, u.policy)
		}
	}
	sort.Strings(names)
	return names
}

// MissingPolicies reports every descriptor whose quotad_policy is not a
// policy that exists (the names of the policy file, as loaded beside these
// descriptors): Errors, one per descriptor, naming its file, domain and
// path; nil when every one exists.
func (c *Config) MissingPolicies(exists func(name string) bool) error {
	var errs Errors
	for _, u := range c.uses {
		if !exists(u.policy) {
			e := u.err
			e.Msg = "no policy " + quote(u.policy) + " in the policy file"
			errs = append(errs, &e)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// Same reports whether c and other were built from the same files with
// the same contents.
func (c *Config) Same(other *Config) bool {
	return c != nil && other != nil && c.digest == other.digest
}

// file is one descriptors file's name (as errors give it) and contents.
type file struct {
	name string
	data []byte
}

// Parse parses one descriptors file: one domain. name is how errors name
// the file. A file with problems returns Errors, every problem in file
// order.
func Parse(name string, data []byte) (*Config, error) {
	return build([]file{{name, data}})
}

// Load reads a descriptors file, or a directory of them: every file named
// *.yaml or *.yml in it and in its subdirectories, in lexical order,
// leaving out every name that starts with a dot (a Kubernetes ConfigMap
// volume keeps its previous contents under ..data and ..<timestamp>). Each
// file holds one domain, and no two files the same one. A directory
// without files is a config without domains. Problems in the files return
// Errors, every problem of every file.
func Load(path string) (*Config, error) {
	files, err := readFiles(path)
	if err != nil {
		return nil, err
	}
	return build(files)
}

// readFiles reads path as Load does.
func readFiles(path string) ([]file, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read rls config: %w", err)
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read rls config: %w", err)
		}
		return []file{{path, data}}, nil
	}
	var files []file
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == path {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !isYAMLName(d.Name()) {
			return nil
		}
		data, err := os.ReadFile(p) // follows a symlink to a file, as ConfigMap volumes have
		if err != nil {
			return err
		}
		files = append(files, file{p, data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read rls config: %w", err)
	}
	return files, nil
}

func isYAMLName(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// build parses every file and joins their domains.
func build(files []file) (*Config, error) {
	c := &Config{domains: map[string]*domain{}, digest: digest(files)}
	var errs Errors
	first := map[string]string{} // the file of each domain, valid or not
	for _, f := range files {
		p := &parser{file: f.name}
		d := p.parseFile(f.data)
		problems := p.problems()
		errs = append(errs, problems...)
		if d == nil {
			continue
		}
		if prev, dup := first[d.name]; dup {
			errs = append(errs, &Error{File: f.name, Domain: d.name, Msg: "domain given again (first in " + prev + ")"})
			continue
		}
		first[d.name] = f.name
		if len(problems) == 0 {
			c.domains[d.name] = d
			c.uses = append(c.uses, p.uses...)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// digest sums the files' names and contents, so a reload notices a change
// to either.
func digest(files []file) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.name), f.name, len(f.data))
		h.Write(f.data)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
