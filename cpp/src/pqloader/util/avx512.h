// Code with AVX-512 intrinsics goes between PQLOADER_AVX512_BEGIN and _END: GCC 12's
// headers start many of them from _mm512_undefined_*(), which -Wmaybe-uninitialized and
// -Wuninitialized take for a read of an uninitialised value (GCC bug 105593), an error
// under -Werror. Elsewhere the macros are empty.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#define PQLOADER_AVX512_BEGIN                                   \
  _Pragma("GCC diagnostic push")                                \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
          _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define PQLOADER_AVX512_END _Pragma("GCC diagnostic pop")
#else
#define PQLOADER_AVX512_BEGIN
#define PQLOADER_AVX512_END
#endif
