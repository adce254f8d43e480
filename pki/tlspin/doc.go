// Package tlspin builds TLS client configurations that trust exactly one
// CA, named by the SHA-256 pin of its public key, instead of the system
// roots. A node knows its control plane only by such pins.
package tlspin
