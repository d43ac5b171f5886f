/* header.c compiled as C++. */
#include "header.c"
