package loadgen

import (
	"runtime"
	"testing"
)

// Engine is one way Run can drive its connections.
type Engine struct {
	Name string
	Use  func(t *testing.T) // for the rest of t
}

func use(loop bool) func(t *testing.T) {
	return func(t *testing.T) {
		was := useLoop
		useLoop = loop
		t.Cleanup(func() { useLoop = was })
	}
}

// Engines lists the ways available here: the epoll loop on Linux, and a
// reader and a writer goroutine per connection everywhere.
func Engines() []Engine {
	e := []Engine{{Name: "goroutines", Use: use(false)}}
	if runtime.GOOS == "linux" {
		e = append(e, Engine{Name: "epoll", Use: use(true)})
	}
	return e
}
