package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// HTTPHandler serves the operator's endpoints:
//
//	/metrics  Prometheus metrics of this server
//	/healthz  200 while the process serves HTTP at all (liveness)
//	/readyz   200 when the sidecar serves its socket, has its policies and
//	          is not draining; 503 with the reason otherwise (readiness).
//	          Redis's health is not part of it.
//	/redisz   200 when Redis answers and holds the decision scripts (it
//	          loads them); 503 with the reason otherwise. For alerts and
//	          people, never for a probe that takes the pod out of service.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeProbe(w, s.ready(r.Context()), "ready", "not ready")
	})
	mux.HandleFunc("GET /redisz", func(w http.ResponseWriter, r *http.Request) {
		writeProbe(w, s.redisHealth(r.Context()), "redis ok", "redis not ok")
	})
	return mux
}

// writeProbe writes a probe's answer: 200 and ok, or 503 and bad with err.
func writeProbe(w http.ResponseWriter, err error, ok, bad string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "%s: %v\n", bad, err)
		return
	}
	_, _ = fmt.Fprintf(w, "%s\n", ok)
}

// HTTPServer is the --http-addr listener.
type HTTPServer struct {
	srv    *http.Server
	l      net.Listener
	served chan error
}

// ListenHTTP listens on addr (host:port; port 0 picks one) and serves the
// server's HTTPHandler until Close. A taken port is an error now, at start,
// not a log line later.
func ListenHTTP(addr string, s *Server) (*HTTPServer, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr %q: %w", addr, err)
	}
	h := &HTTPServer{
		srv: &http.Server{
			Handler:           s.HTTPHandler(),
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          zap.NewStdLog(s.log.Named("http")),
		},
		l:      l,
		served: make(chan error, 1),
	}
	go func() { h.served <- h.srv.Serve(l) }()
	s.log.Info("serving metrics and probes", zap.String(keyHTTPAddr, l.Addr().String()))
	return h, nil
}

// Addr is the address it listens on.
func (h *HTTPServer) Addr() string { return h.l.Addr().String() }

// Close stops it, letting requests in progress finish for up to a second
// (a scrape or a probe is quick).
func (h *HTTPServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := h.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = h.srv.Close()
	}
	if serr := <-h.served; !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
