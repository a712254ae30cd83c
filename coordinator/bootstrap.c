/* bootstrap.c - placeholder */
