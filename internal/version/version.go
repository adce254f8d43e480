// Package version holds the build's version string, set at link time with
// -ldflags "-X github.com/nodetrust/nodetrust/internal/version.Version=…".
package version

// Version is the release this binary was built from.
var Version = "dev"
