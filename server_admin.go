package kernrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// adminServer is the server's HTTP side door (server.admin_address): the
// routes its plugins offer (kernel.AdminHandler, such as /metrics), an
// HTTP health probe, and an index of them all.
type adminServer struct {
	http   *http.Server
	addr   string
	served chan struct{} // closed when Serve has returned
}

type adminEntry struct {
	Pattern, Doc, Plugin string
}

// startAdmin listens on server.admin_address, if set.
func (s *Server) startAdmin() error {
	addr := s.cfg.Server.AdminAddress
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	entries := []adminEntry{
		{"GET /{$}", "this index", "kernrpc"},
		{"GET /healthz", "200 while the server and its service are serving, 503 otherwise (for HTTP probes)", "kernrpc"},
	}
	mux.HandleFunc("GET /healthz", s.serveHealthz)
	// The index before the plugins' routes, so that one claiming it
	// clashes as an error (handleSafely), not a panic; it lists entries
	// as they are once the routes are all in.
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { s.serveAdminIndex(w, entries) })
	entries = s.mountConsole(mux, entries)
	for _, b := range s.plugins.list() {
		ah, ok := b.Plugin.(kernel.AdminHandler)
		if !ok {
			continue
		}
		for _, r := range ah.AdminRoutes() {
			if err := handleSafely(mux, r.Pattern, r.Handler); err != nil {
				return s.adminError(fmt.Errorf("%s %q: route %q: %w", b.Kind, b.Name, r.Pattern, err))
			}
			entries = append(entries, adminEntry{r.Pattern, r.Doc, string(b.Kind) + " " + b.Name})
		}
	}
	slices.SortStableFunc(entries, func(a, b adminEntry) int { return cmp.Compare(a.Pattern, b.Pattern) })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return s.adminError(err)
	}
	a := &adminServer{
		http:   &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		addr:   ln.Addr().String(),
		served: make(chan struct{}),
	}
	go func() {
		defer close(a.served)
		if err := a.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin HTTP server stopped", "address", a.addr, "err", err)
		}
	}()
	s.mu.Lock()
	s.admin = a
	s.mu.Unlock()
	s.log.Info("admin pages served", "address", "http://"+a.addr+"/")
	return nil
}

func (s *Server) adminError(err error) error {
	return fmt.Errorf("kernrpc: %s: server.admin_address %q: %w", sourceOr(s.cfg.Source), s.cfg.Server.AdminAddress, err)
}

// handleSafely is mux.Handle, with a bad or clashing pattern an error
// rather than a panic.
func handleSafely(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	if h == nil {
		return errors.New("no handler")
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// AdminAddr is the address the admin pages are served on; empty when
// server.admin_address is not set or before Start.
func (s *Server) AdminAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin == nil {
		return ""
	}
	return s.admin.addr
}

// stopAdmin closes the admin server, last of all, so that a scrape
// during the drain still sees the figures.
func (s *Server) stopAdmin(ctx context.Context) {
	s.mu.Lock()
	a := s.admin
	s.mu.Unlock()
	if a == nil {
		return
	}
	if err := a.http.Shutdown(ctx); err != nil {
		_ = a.http.Close()
	}
	<-a.served
}

func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	st := s.probeStatus()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if st != HealthServing {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintln(w, st)
}

var adminIndex = template.Must(template.New("index").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>kernrpc {{.Service}}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em}td,th{padding:.2em 1em;text-align:left}</style></head>
<body><h1>kernrpc: {{.Service}}</h1>
<table><tr><th>page</th><th>what it shows</th><th>served by</th></tr>
{{range .Entries}}<tr><td><code>{{.Pattern}}</code></td><td>{{.Doc}}</td><td>{{.Plugin}}</td></tr>
{{end}}</table></body></html>
`))

func (s *Server) serveAdminIndex(w http.ResponseWriter, entries []adminEntry) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = adminIndex.Execute(w, struct {
		Service string
		Entries []adminEntry
	}{s.cfg.Service, entries})
}
