// Package identity keeps a node's identity in its data directory (data_dir,
// default /var/lib/bcd): the certificate and trust bundle in identity.json,
// the node key in node.key, a renewal's next key in node.key.next, and the
// node's journal in journal.db.
//
// LoadState reads the identity the way every agent mode does at start, and
// repairs what an interrupted renewal left behind; ReadIdentity and ReadKey
// read the same files for a process that does not own them (the node daemon
// following renewals), changing nothing. Persist stores a newly
// joined identity, WriteNextKey and StoreRenewal store a renewal in an order
// that leaves a key and a certificate that match after a crash at any point,
// and ResetPlan and MoveAside serve bcd join --reset.
//
// Every file is written atomically (package internal/atomicfile), so a crash
// leaves the old or the new content of a file, never a torn one. The package
// does not check a certificate's validity period, its chain or its SPIFFE ID:
// the join and the renewal check an answer before it is stored, and bcd doctor
// reports an expired certificate.
//
// Errors meant for an operator end with the way back for the node's
// attestor ([WayBack]), such as "join again: bcd join --reset --yes
// --attestor tpm" for a node that joined with its TPM.
package identity
