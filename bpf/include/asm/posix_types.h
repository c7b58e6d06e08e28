/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* carbd: see asm/types.h. */
#ifndef CARBD_ASM_POSIX_TYPES_H
#define CARBD_ASM_POSIX_TYPES_H
#include <asm-generic/posix_types.h>
#endif
