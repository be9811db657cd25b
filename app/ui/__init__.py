"""The user's memory page (`/ui/memory`): static HTML, CSS and JavaScript that call the public
`/v1/me/*` API from the browser with the user's bearer token; nothing here reads the domain."""
