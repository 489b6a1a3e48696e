/* llhttp's src/api.c (llhttp/SOURCE.md), with the one warning its code raises under -Wextra
 * turned off here alone: the guard's own files keep every warning an error. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "llhttp/src/api.c"
