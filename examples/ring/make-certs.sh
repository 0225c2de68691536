#!/bin/sh
# Make the certificates for a ring: one CA for ingresses, another for workers, an ingress
# certificate valid for the names in $INGRESS_NAMES, and one certificate per worker name given.
#
#   INGRESS_NAMES="DNS:localhost,IP:127.0.0.1" ./examples/ring/make-certs.sh certs worker-1 worker-2
#
# Writes into DIR (here certs/): ingress-ca.pem, workers-ca.pem, ingress.pem + ingress.key, and
# WORKER.pem + WORKER.key for each worker. Keep the *-ca.key files offline.
set -eu
dir=${1:?usage: make-certs.sh DIR WORKER...}
shift
names=${INGRESS_NAMES:-DNS:localhost,IP:127.0.0.1}
days=${DAYS:-365}
mkdir -p "$dir"
cd "$dir"

ca() {  # ca NAME CN
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
        -keyout "$1.key" -out "$1.pem" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

leaf() {  # leaf NAME CA USAGE SAN
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=$3" "subjectAltName=$4" "subjectKeyIdentifier=hash" \
        "authorityKeyIdentifier=keyid,issuer" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
        -days "$days" -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

[ -f ingress-ca.pem ] || ca ingress-ca "llmtrio ingress CA"
[ -f workers-ca.pem ] || ca workers-ca "llmtrio workers CA"
leaf ingress ingress-ca serverAuth "$names"
for worker in "$@"; do
    leaf "$worker" workers-ca clientAuth "DNS:$worker"
done
ls -1 "$PWD"
