// Package install issues install codes and releases rendered machine
// configs over HTTPS exactly once (seed 003 section 3, "Installation and
// config release"; docs/install.md "Config release").
//
// For an eligible provision the control plane renders the machine's config
// and calls [Releaser.Issue]: a random 256-bit install code is made, the
// config is sealed under a key derived from it and stored with a verifier
// derived from it (the store never holds the code), and the code is wrapped
// to the session's TPM ([WrapCode], TPM2_MakeCredential to its EK and AK
// name), so only that TPM's ActivateCredential recovers it.
//
// The installed machine then fetches GET /v1/config/{uuid} with the code as
// its bearer credential ([Releaser.Handler]). One fetch at a time claims the
// config; the code burns only when the kernel says the peer acknowledged
// every byte of the response; a response that stops early leaves it valid
// until the config expires. After the burn the node becomes active through
// the lifecycle manager; an activation that fails is retried by
// [Releaser.Sweep] until it is settled.
//
// Nothing here logs the code or the config.
package install
