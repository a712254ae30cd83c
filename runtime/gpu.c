/* gpu.c - placeholder, being written. */
