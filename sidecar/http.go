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
//	/readyz   200 when Redis answers and holds the scripts and the server is
//	          not draining; 503 with the reason otherwise (readiness)
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := s.checkReady(r.Context(), true); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
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
