package limits

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// boundValues are the constants of limits.go by name, evaluated.
func boundValues(t *testing.T) map[string]constant.Value {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "limits.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	bounds := map[string]constant.Value{}
	eachConst(f, func(name *ast.Ident, v constant.Value) {
		if name.IsExported() && v.Kind() == constant.Int {
			bounds[name.Name] = v
		}
	}, nil)
	if len(bounds) < 10 {
		t.Fatalf("found %d bounds in limits.go: %v", len(bounds), bounds)
	}
	return bounds
}

// eachConst calls f for each constant of file whose value is integer
// arithmetic on literals, and other (when not nil) for each one whose
// value is another expression.
func eachConst(file *ast.File, f func(*ast.Ident, constant.Value), other func(*ast.Ident, ast.Expr)) {
	for _, d := range file.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue // iota repeated
				}
				if v := literal(vs.Values[i]); v != nil {
					f(name, v)
				} else if other != nil {
					other(name, vs.Values[i])
				}
			}
		}
	}
}

// literal evaluates integer arithmetic on literals (31 * 24 * 60 * 60 *
// 1000); nil for anything else.
func literal(e ast.Expr) constant.Value {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.INT {
			return constant.MakeFromLiteral(e.Value, token.INT, 0)
		}
	case *ast.ParenExpr:
		return literal(e.X)
	case *ast.BinaryExpr:
		x, y := literal(e.X), literal(e.Y)
		if x != nil && y != nil && (e.Op == token.ADD || e.Op == token.SUB || e.Op == token.MUL) {
			return constant.BinaryOp(x, e.Op, y)
		}
	}
	return nil
}

// sourceFiles parses every non-test Go file of the module outside this
// package.
func sourceFiles(t *testing.T) map[string]*ast.File {
	t.Helper()
	files := map[string]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (path == "../limits" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != ".."):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		files[path] = f
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found %d Go files in the module", len(files))
	}
	return files
}

// No package but limits gives one of its bounds a value: a constant of
// another package named like a bound is the bound itself (limits.MaxLimit),
// no max or min constant there holds a bound's number, and no message
// writes one out as the end of a range ("from 1 to 1000000000"). Numbers
// below 1000 (64, 128) and defaults (10000) are too common to tell apart,
// so they are caught by name only.
func TestBoundsAreDeclaredHereOnly(t *testing.T) {
	bounds := boundValues(t)
	byName := map[string]string{}
	var numbers []string
	for name, v := range bounds {
		byName[strings.ToLower(name)] = name
		if n, _ := constant.Int64Val(v); n >= 1000 && !strings.HasPrefix(name, "Default") {
			numbers = append(numbers, strconv.FormatInt(n, 10))
		}
	}
	isNumber := func(s string) bool { return slices.Contains(numbers, s) }
	for path, f := range sourceFiles(t) {
		eachConst(f, func(name *ast.Ident, v constant.Value) {
			if bound, ok := byName[strings.ToLower(name.Name)]; ok {
				t.Errorf("%s: const %s = %s: use limits.%s", path, name.Name, v, bound)
			} else if isNumber(v.ExactString()) && isBoundName(name.Name) {
				t.Errorf("%s: const %s = %s is a bound of package limits: use it from there", path, name.Name, v)
			}
		}, func(name *ast.Ident, e ast.Expr) {
			bound, ok := byName[strings.ToLower(name.Name)]
			if sel, isSel := e.(*ast.SelectorExpr); ok && (!isSel || sel.Sel.Name != bound || !isIdent(sel.X, "limits")) {
				t.Errorf("%s: const %s is limits.%s and must be declared as it", path, name.Name, bound)
			}
		})
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, m := range rangeText.FindAllStringSubmatch(s, -1) {
				if isNumber(m[1]) {
					t.Errorf("%s: %q writes out the bound %s: build the text from package limits", path, s, m[1])
				}
			}
			return true
		})
	}
}

// rangeText finds the upper end of a range in a message: "from 1 to N",
// "at most N".
var rangeText = regexp.MustCompile(`\b(?:to|most) ([0-9]+)\b`)

// isBoundName reports whether a constant's name says it bounds something
// (maxFoo, MinBar), as opposed to a value that happens to be as large
// (a benchmark's hour-long window).
func isBoundName(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "max") || strings.HasPrefix(n, "min")
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// The packages that read bounds and shapes from here keep to their side:
// the policy file knows no wire and no Redis, the wire no Redis and no
// policy file, the RLS descriptors none of those, and limits nothing of
// quotad's.
func TestImportRules(t *testing.T) {
	for pkg, allowed := range map[string][]string{
		"quotad/limits":   nil,
		"quotad/policy":   {"quotad/limits"},
		"quotad/protocol": {"quotad/limits"},
		// The descriptors file knows no wire, no policy file and no Redis.
		"quotad/rls/descriptors": {"quotad/limits"},
	} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, pkg) {
			t.Fatalf("go list -deps %s does not list the package itself: %q", pkg, deps)
		}
		for _, dep := range deps {
			quotad := dep == "quotad" || strings.HasPrefix(dep, "quotad/")
			if quotad && dep != pkg && !slices.Contains(allowed, dep) || strings.Contains(dep, "rueidis") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
