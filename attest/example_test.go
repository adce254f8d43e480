package attest_test

import (
	"fmt"

	"github.com/nodetrust/nodetrust/attest"
)

// A freshly started TPM (swtpm, the simulator) has PCRs 0–7 all zero and no
// measurement log: the empty log replays, and the Secure Boot state is
// unknown (nil), not "off".
func ExampleReplayEventLog() {
	pcrs := map[int][]byte{}
	for _, i := range attest.QuotePCRs {
		pcrs[i] = make([]byte, 32)
	}
	log, err := attest.ReplayEventLog(nil, pcrs)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(log.Events), "events; Secure Boot known:", log.SecureBoot != nil)

	pcrs[4][0] = 1 // measured, yet the log says nothing about PCR 4
	_, err = attest.ReplayEventLog(nil, pcrs)
	fmt.Println(err)
	// Output:
	// 0 events; Secure Boot known: false
	// attest: event log refused: PCR 4 has no event in the (empty) log but is not at its initial value
}
