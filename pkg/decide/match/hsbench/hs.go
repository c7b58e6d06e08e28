//go:build hyperscan && cgo

package hsbench

/*
#cgo LDFLAGS: -lhs
#include <stdlib.h>
#include <hs/hs.h>

static int hsbench_on_match(unsigned int id, unsigned long long from,
		unsigned long long to, unsigned int flags, void *ctx) {
	(*(unsigned long long *)ctx)++;
	return 0;
}

// hsbench_count scans data and counts the callbacks: with
// HS_FLAG_SINGLEMATCH, the number of distinct patterns found.
static hs_error_t hsbench_count(const hs_database_t *db, const char *data,
		unsigned int len, hs_scratch_t *scratch, unsigned long long *n) {
	*n = 0;
	return hs_scan(db, data, len, 0, scratch, hsbench_on_match, n);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// DB is a compiled set of literal patterns and the scratch space for one
// goroutine's scans.
type DB struct {
	db      *C.hs_database_t
	scratch *C.hs_scratch_t
}

// Compile builds a block-mode database of the patterns as literals,
// matched byte for byte (case-sensitive), each reported once per scan.
func Compile(patterns []string) (*DB, error) {
	if len(patterns) == 0 {
		return nil, errors.New("hsbench: no patterns")
	}
	n := len(patterns)
	exprs := unsafe.Slice((**C.char)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof((*C.char)(nil))))), n)
	lens := unsafe.Slice((*C.size_t)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(C.size_t(0))))), n)
	flags := unsafe.Slice((*C.uint)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(C.uint(0))))), n)
	ids := unsafe.Slice((*C.uint)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(C.uint(0))))), n)
	defer func() {
		for _, e := range exprs {
			C.free(unsafe.Pointer(e))
		}
		C.free(unsafe.Pointer(&exprs[0]))
		C.free(unsafe.Pointer(&lens[0]))
		C.free(unsafe.Pointer(&flags[0]))
		C.free(unsafe.Pointer(&ids[0]))
	}()
	for i, p := range patterns {
		exprs[i] = C.CString(p)
		lens[i] = C.size_t(len(p))
		flags[i] = C.HS_FLAG_SINGLEMATCH
		ids[i] = C.uint(i)
	}
	var db *C.hs_database_t
	var cerr *C.hs_compile_error_t
	if rc := C.hs_compile_lit_multi(&exprs[0], &flags[0], &ids[0], &lens[0], C.uint(n), C.HS_MODE_BLOCK, nil, &db, &cerr); rc != C.HS_SUCCESS {
		msg := "unknown error"
		if cerr != nil {
			msg = C.GoString(cerr.message)
			C.hs_free_compile_error(cerr)
		}
		return nil, fmt.Errorf("hsbench: compile %d literals: %s (%d)", n, msg, int(rc))
	}
	d := &DB{db: db}
	if rc := C.hs_alloc_scratch(db, &d.scratch); rc != C.HS_SUCCESS {
		C.hs_free_database(db)
		return nil, fmt.Errorf("hsbench: allocate scratch: error %d", int(rc))
	}
	return d, nil
}

// Count returns how many distinct patterns occur in data.
func (d *DB) Count(data string) (int, error) {
	if len(data) > math.MaxUint32 {
		return 0, errors.New("hsbench: data over 4 GiB")
	}
	if data == "" {
		return 0, nil // no literal is empty; Hyperscan refuses a nil block
	}
	var n C.ulonglong
	p := (*C.char)(unsafe.Pointer(unsafe.StringData(data)))
	if rc := C.hsbench_count(d.db, p, C.uint(len(data)), d.scratch, &n); rc != C.HS_SUCCESS {
		return 0, fmt.Errorf("hsbench: scan: error %d", int(rc))
	}
	return int(n), nil
}

// Close frees the database and its scratch space.
func (d *DB) Close() {
	C.hs_free_scratch(d.scratch)
	C.hs_free_database(d.db)
}
