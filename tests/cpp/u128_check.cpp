// The portable 128-bit integer (MSVC's) against the compiler's own on random operands;
// compiled and run by tests/test_u128.py where a compiler with __int128 is found.
#define FASTSHARD_PORTABLE_U128
#include "fastshard/u128.hpp"
#include <cstdio>
#include <random>
using P = fastshard::u128;
typedef unsigned __int128 B;
static B tob(P p){ return ((B)(std::uint64_t)(p>>64) << 64) | (std::uint64_t)p; }
static P top(B b){ return (P((std::uint64_t)(b>>64)) << 64) + P((std::uint64_t)b); }
int main(){ std::mt19937_64 g(1); long bad=0;
 for(int t=0;t<2000000;t++){ B a=((B)g()<<64)|g(), b=((B)g()<<64)|g();
  int sh=g()%128; a >>= (g()%128); b >>= (g()%128); if(!b) b=1;
  P pa=top(a), pb=top(b);
  if(tob(pa+pb)!=a+b||tob(pa-pb)!=a-b||tob(pa*pb)!=a*b||tob(pa/pb)!=a/b||tob(pa%pb)!=a%b||(pa<pb)!=(a<b)||tob(pa<<sh)!=(a<<sh)||tob(pa>>sh)!=(a>>sh)) bad++; }
 printf("bad=%ld\n",bad); return bad!=0; }
