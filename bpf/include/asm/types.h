/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * carbd: the UAPI headers of linux-libc-dev include <asm/types.h>, which
 * Debian keeps in the multiarch directory (/usr/include/x86_64-linux-gnu)
 * where clang -target bpf does not look. The BPF target is a 64-bit
 * architecture with the generic integer types, so the generic header is
 * the right one for every host.
 */
#ifndef CARBD_ASM_TYPES_H
#define CARBD_ASM_TYPES_H
#include <asm-generic/types.h>
#endif
