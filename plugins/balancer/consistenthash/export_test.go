package consistenthash

// FNV1a exposes the hash for the test that checks it against hash/fnv.
var FNV1a = fnv1a
