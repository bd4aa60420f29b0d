// Loaded with `node --require` before js-ipfs 0.66.1: its dependencies call
// Promise.withResolvers, which Node 20 does not have (it arrived in Node 22).
'use strict'
if (typeof Promise.withResolvers !== 'function') {
  Object.defineProperty(Promise, 'withResolvers', {
    configurable: true,
    writable: true,
    value: function withResolvers () {
      let resolve
      let reject
      const promise = new this((res, rej) => { resolve = res; reject = rej })
      return { promise, resolve, reject }
    }
  })
}
