// Package keyslot is Redis Cluster's hash slot of a key, as Redis
// computes it (CLUSTER KEYSLOT): the batcher groups the calls of one slot,
// a take of several limits checks that its keys share one, and the store
// finds the node that serves a key.
package keyslot

import "strings"

// Count is the number of hash slots of a Redis Cluster.
const Count = 16384

// Of is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (what is between its first '{' and the next '}', when not
// empty) or of the whole key, modulo 16384.
func Of(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16[byte(crc>>8)^key[i]]
	}
	return crc & 16383
}

// crc16 is the table of CRC16-XMODEM (polynomial 0x1021), as Redis hashes
// keys.
var crc16 = func() (t [256]uint16) {
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
