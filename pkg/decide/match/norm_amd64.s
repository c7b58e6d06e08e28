// SSSE3 kernel of the normaliser (see norm_amd64.go): lowercase ASCII and
// drop ASCII whitespace, 16 bytes at a time.

#include "textflag.h"

// func normASCII(dst []byte, src string, tab *normTables) (n int, i int)
//
// Normalises src[i:i+16] into dst[n:] while 16 source bytes remain, dst
// has room for 16 more bytes and the 16 bytes are all ASCII. It returns
// the bytes written and the bytes consumed.
TEXT ·normASCII(SB), NOSPLIT, $0-64
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), R8
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), R9
	MOVQ tab+40(FP), R10
	LEAQ 2048(R10), R12 // tab.keep
	XORQ AX, AX         // n
	XORQ BX, BX         // i
	SUBQ $16, R8        // largest n that leaves room for 16 bytes
	JL   done
	SUBQ $16, R9        // largest i with 16 bytes left
	JL   done

	MOVQ       $0x4040404040404040, R11
	MOVQ       R11, X9
	PUNPCKLQDQ X9, X9                   // '@'
	MOVQ       $0x5b5b5b5b5b5b5b5b, R11
	MOVQ       R11, X10
	PUNPCKLQDQ X10, X10                 // '[' = 'Z'+1
	MOVQ       $0x2020202020202020, R11
	MOVQ       R11, X11
	PUNPCKLQDQ X11, X11                 // ' ', and the case bit
	MOVQ       $0x0808080808080808, R11
	MOVQ       R11, X12
	PUNPCKLQDQ X12, X12                 // '\t'-1
	MOVQ       $0x0e0e0e0e0e0e0e0e, R11
	MOVQ       R11, X13
	PUNPCKLQDQ X13, X13                 // '\r'+1
	MOVQ       $0x0808080808080808, R11
	MOVQ       R11, X14                 // 8 in the low half: high-half shuffle offset

loop:
	CMPQ     BX, R9
	JGT      done
	CMPQ     AX, R8
	JGT      done
	MOVOU    (SI)(BX*1), X0
	PMOVMSKB X0, CX
	TESTL    CX, CX
	JNZ      done                       // a non-ASCII byte: the caller decodes it

	// Lowercase: bytes in 'A'..'Z' get the 0x20 bit (signed compares are
	// exact for ASCII).
	MOVO    X0, X1
	PCMPGTB X9, X1                      // x > '@'
	MOVO    X10, X2
	PCMPGTB X0, X2                      // '[' > x
	PAND    X2, X1
	PAND    X11, X1
	POR     X1, X0

	// Whitespace: ' ' or '\t'..'\r'.
	MOVO     X0, X3
	PCMPEQB  X11, X3
	MOVO     X0, X4
	PCMPGTB  X12, X4                    // x > 8
	MOVO     X13, X5
	PCMPGTB  X0, X5                     // 14 > x
	PAND     X5, X4
	POR      X4, X3
	PMOVMSKB X3, CX

	// Compact each 8-byte half with its shuffle, store both halves.
	MOVQ       CX, DX
	ANDQ       $0xff, DX
	MOVQ       CX, R11
	SHRQ       $8, R11
	MOVQ       (R10)(DX*8), X6
	MOVQ       (R10)(R11*8), X7
	PADDB      X14, X7
	PUNPCKLQDQ X7, X6
	PSHUFB     X6, X0
	MOVQ       X0, (DI)(AX*1)
	MOVBQZX    (R12)(DX*1), DX
	ADDQ       DX, AX
	PSRLDQ     $8, X0
	MOVQ       X0, (DI)(AX*1)
	MOVBQZX    (R12)(R11*1), R11
	ADDQ       R11, AX
	ADDQ       $16, BX
	JMP        loop

done:
	MOVQ AX, n+48(FP)
	MOVQ BX, i+56(FP)
	RET

// func hasSSSE3() bool
TEXT ·hasSSSE3(SB), NOSPLIT, $0-1
	MOVL  $1, AX
	XORL  CX, CX
	CPUID
	SHRL  $9, CX
	ANDL  $1, CX
	MOVB  CX, ret+0(FP)
	RET
