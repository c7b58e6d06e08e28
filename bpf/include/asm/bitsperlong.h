/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* carbd: see asm/types.h. BPF is a 64-bit target. */
#ifndef CARBD_ASM_BITSPERLONG_H
#define CARBD_ASM_BITSPERLONG_H
#define __BITS_PER_LONG 64
#include <asm-generic/bitsperlong.h>
#endif
