"""The pages of `/ui`: the user's memory page (`/ui/memory`) and the admin console (`/ui/admin`),
static HTML, CSS and JavaScript that call the public API from the browser with the caller's
bearer token; nothing here reads the domain."""
