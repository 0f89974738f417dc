"""A DataLoader worker's C heap kept between batches.

Every sample allocates and frees megabytes (decoded images, the mosaic's output, OpenCV's temporaries). With glibc's
defaults a block of more than 128 kB (raised up to 32 MB as blocks are freed) is its own memory mapping, and free
memory above 128 kB at the top of the heap goes back to the kernel: the next batch then takes fresh pages again,
each a page fault the kernel zeroes (in a fresh worker 700-800 per 640-px mosaic, more than a millisecond of
kernel time). ``keep_freed_memory`` asks glibc to serve blocks up to MMAP_LIMIT from the heap and to keep up to
KEEP_LIMIT of free memory for reuse: a worker then holds what its largest batch needed, and its pages fault once.

Other C libraries (musl, macOS, Windows) are left as they are: the settings are glibc's ``mallopt``.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_LIMIT = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2)
KEEP_LIMIT = 256 << 20  # free heap memory kept for the next batches, at most


def keep_freed_memory() -> bool:
    """Keep freed memory in this process's heap for reuse (glibc only); True when glibc took the settings."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_LIMIT)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_LIMIT))
