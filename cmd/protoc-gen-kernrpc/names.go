package main

import (
	"fmt"

	"google.golang.org/protobuf/compiler/protogen"
)

// checkNames refuses a file whose generated names would clash: with a name
// protoc-gen-go declares in the same Go package, with a name generated for
// another service of the package, or, among a client's methods, one RPC's
// Async or Func form with another RPC. The compiler would refuse the
// generated code anyway; this says which .proto names to change.
func checkNames(gen *protogen.Plugin, f *protogen.File) error {
	for _, s := range f.Services {
		if err := checkMethods(s); err != nil {
			return err
		}
	}
	declared := make(map[string]string) // Go name -> what declares it
	var services []*protogen.Service
	for _, pf := range gen.Files {
		if pf.GoImportPath != f.GoImportPath {
			continue
		}
		for _, m := range pf.Messages {
			messageNames(declared, m)
		}
		for _, e := range pf.Enums {
			enumNames(declared, e)
		}
		for _, x := range pf.Extensions {
			declared["E_"+x.GoIdent.GoName] = "extension " + string(x.Desc.FullName())
		}
		services = append(services, pf.Services...)
	}
	// Every service of the package, so that two files' services are
	// checked against each other whichever is generated first.
	for _, s := range services {
		n := namesOf(s)
		names := []string{n.serviceConst, n.server, n.register, n.client, n.newClient}
		for _, m := range s.Methods {
			names = append(names, methodConst(m))
		}
		what := "the code generated for service " + string(s.Desc.FullName())
		for _, name := range names {
			if other, ok := declared[name]; ok {
				return fmt.Errorf("%s: %s declares %s, which %s declares too; rename one of them in the .proto",
					s.Location.SourceFile, what, name, other)
			}
			declared[name] = what
		}
	}
	return nil
}

// checkMethods checks that a service's RPCs give distinct Go method names,
// on the server interface and on the client.
func checkMethods(s *protogen.Service) error {
	onClient := make(map[string]*protogen.Method)
	onServer := make(map[string]*protogen.Method)
	for _, m := range s.Methods {
		if other := onServer[m.GoName]; other != nil {
			return fmt.Errorf("%s: service %s: rpcs %s and %s are both the Go method %s; rename one of them",
				s.Location.SourceFile, s.Desc.FullName(), other.Desc.Name(), m.Desc.Name(), m.GoName)
		}
		onServer[m.GoName] = m
		for _, name := range clientMethods(m) {
			if other := onClient[name]; other != nil {
				return fmt.Errorf("%s: service %s: the client's method %s would serve both rpc %s and rpc %s (unary rpcs get Async and Func forms); rename one of them",
					s.Location.SourceFile, s.Desc.FullName(), name, other.Desc.Name(), m.Desc.Name())
			}
			onClient[name] = m
		}
	}
	return nil
}

func messageNames(declared map[string]string, m *protogen.Message) {
	what := "message " + string(m.Desc.FullName())
	declared[m.GoIdent.GoName] = what
	for _, fl := range m.Fields {
		// A default value is the constant (or variable) Default_M_F.
		if fl.Desc.HasDefault() {
			declared["Default_"+m.GoIdent.GoName+"_"+fl.GoName] = what + "'s default of " + string(fl.Desc.Name())
		}
	}
	for _, o := range m.Oneofs {
		for _, fl := range o.Fields {
			declared[fl.GoIdent.GoName] = what + "'s oneof " + string(o.Desc.Name())
		}
	}
	for _, e := range m.Enums {
		enumNames(declared, e)
	}
	for _, x := range m.Extensions {
		declared["E_"+x.GoIdent.GoName] = "extension " + string(x.Desc.FullName())
	}
	for _, nested := range m.Messages {
		messageNames(declared, nested)
	}
}

func enumNames(declared map[string]string, e *protogen.Enum) {
	what := "enum " + string(e.Desc.FullName())
	for _, name := range []string{e.GoIdent.GoName, e.GoIdent.GoName + "_name", e.GoIdent.GoName + "_value"} {
		declared[name] = what
	}
	for _, v := range e.Values {
		declared[v.GoIdent.GoName] = what
	}
}
