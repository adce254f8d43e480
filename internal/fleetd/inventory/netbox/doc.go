// Package netbox is the NetBox inventory source ([inventory] source =
// "netbox"): fleetd reads devices and their custom fields from NetBox's
// REST API (4.x) and honours an EK binding only when NetBox's object-change
// log (/api/core/object-changes/) shows the configured declarer user wrote
// it last. It speaks the API with net/http; a NetBox that cannot answer is
// an error, and admission refuses (nothing already issued changes).
//
// The wiring (internal/fleetd) builds it; tests run it against
// netbox/netboxfake, a fake NetBox that follows the OpenAPI schema go-netbox
// v4.3.0 ships.
package netbox
