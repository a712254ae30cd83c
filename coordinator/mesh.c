/* mesh.c - placeholder */
