package admit

import (
	"net"
	"strings"

	"github.com/nodetrust/nodetrust/pki/netreport"
)

// Normalize is the form in which a declared and a reported switch value
// are compared: surrounding space trimmed, inner runs of space made one,
// lower case, and a MAC address (aa:bb:…, aa-bb-…, aabb.ccdd.eeff or twelve
// bare hex digits) written as aa:bb:cc:dd:ee:ff. Names are compared as the
// switch sends them: "Gi1/0/17" is not "GigabitEthernet1/0/17".
func Normalize(s string) string {
	s = strings.ToLower(strings.Join(strings.Fields(s), " "))
	if len(s) == 12 && isHex(s) {
		s = s[0:2] + ":" + s[2:4] + ":" + s[4:6] + ":" + s[6:8] + ":" + s[8:10] + ":" + s[10:12]
	}
	if mac, err := net.ParseMAC(s); err == nil && len(mac) == 6 {
		return mac.String()
	}
	return s
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ChassisMatches reports whether the declared chassis is the report's
// chassis id or its system name (a declaration names a switch either way).
func ChassisMatches(declared string, r netreport.Report) bool {
	want := Normalize(declared)
	return want != "" && (want == Normalize(r.ChassisID) || (r.ChassisName != "" && want == Normalize(r.ChassisName)))
}

// PortMatches reports whether the declared port is the report's port id or
// its port description: switches that send a MAC or an index as the port
// id send the interface's name as its description (lldpd does).
func PortMatches(declared string, r netreport.Report) bool {
	want := Normalize(declared)
	return want != "" && (want == Normalize(r.PortID) || (r.PortDescr != "" && want == Normalize(r.PortDescr)))
}
