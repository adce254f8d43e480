package pki_test

import (
	"crypto/sha256"
	"fmt"

	"github.com/nodetrust/nodetrust/pki"
)

// A node seals its join token to the JoinService's key for its own CSR;
// only the holder of the key can open it, and only for that CSR.
func ExampleSealToken() {
	key, err := pki.GenerateJoinEncryptionKey(pki.KEMP256) // fleetd init
	if err != nil {
		panic(err)
	}
	jwk, _ := key.Public().MarshalJWK() // join-encryption.jwk

	// On the node: parse the JWK (its kid is checked against the key),
	// make a CSR for the node key, and seal the token to it.
	pub, err := pki.ParseJWK(jwk)
	if err != nil {
		panic(err)
	}
	nodeKey, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(nodeKey)
	h := sha256.Sum256(csr)
	sealed, _ := pki.SealToken(pub, h[:], []byte("nt1_example-token"))

	// On the server.
	token, err := key.OpenToken(h[:], sealed)
	fmt.Println(string(token), err)

	other := sha256.Sum256([]byte("another CSR"))
	_, err = key.OpenToken(other[:], sealed)
	fmt.Println(err != nil)
	// Output:
	// nt1_example-token <nil>
	// true
}
