package kernel

import "net/http"

// AdminRoute is one page a plugin serves on the admin HTTP address.
type AdminRoute struct {
	// Pattern is an http.ServeMux pattern, such as "GET /metrics".
	Pattern string
	Handler http.Handler
	// Doc says in a few words what the page shows, for the admin index.
	Doc string
}

// AdminHandler is an optional interface for a plugin of any kind: the
// engine mounts its routes on the admin HTTP address (server.admin_address)
// beside its own status pages. A metrics exporter serves /metrics this way.
// AdminRoutes is called once, after the plugin is built.
type AdminHandler interface {
	AdminRoutes() []AdminRoute
}
