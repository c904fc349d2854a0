package luascript

import "strings"

// KeySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, the part between the first "{" and the next "}" when that is
// not empty, or of the whole key otherwise. The keys of one script call
// must share a slot on a Cluster.
func KeySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return crc & 16383
}

// crc16Table is CRC16-XMODEM's (polynomial 0x1021), as Redis hashes keys.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
